"""Kokoro-82M (hexgrad/kokoro): four CoreML stages plus host DSP.

`family.py` is the torch-free declaration the workflow reads; `impl.py` builds the stages.
"""
