"""Fish Audio S2 Pro (Dual-AR text-to-semantic + modded DAC codec): weights, loader, upstream reference.

Not yet registered in anetts.families: the stages come with the family-neutral core.
"""
