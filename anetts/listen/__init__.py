"""Judging speech as a listener would, offline: words, voice, pitch and quality against upstream's own
variation.

- :mod:`anetts.listen.toolkit`: the listener models, each from a pinned registry package (Whisper
  base, Resemblyzer, DistillMOS, DNSMOS P.808; pyin needs none), loaded once.
- :mod:`anetts.listen.metrics`: what a clip says, who says it, how well and at what pitch, and how two
  clips of one sentence differ by each of those.
- :mod:`anetts.listen.corpus`: the sentences per language (prose, numbers, names).
- :mod:`anetts.listen.gate`: a candidate's clips against upstream's at one seed, beside upstream at
  another seed (the floor); each metric holds when the candidate lies within floor + margin.

The Kokoro side (rendering the corpus through upstream and through a build) is
:mod:`anetts.models.kokoro.listen`; ``anetts listen`` is the command.
"""
