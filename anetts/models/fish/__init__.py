"""Fish Audio S2 Pro (Dual-AR text-to-semantic + modded DAC codec): declaration, weights, stages, reference."""
