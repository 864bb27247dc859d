"""Two studies compared point by point: ratios with intervals and verdicts.

`python -m scalestudy.compare A B` (compare/__main__.py).
"""
