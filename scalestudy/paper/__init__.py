"""The paper: booktabs tables (tables), the numbers of the text as LaTeX macros (numbers), the draft
written from the template in report/paper/ (draft) and its PDF (build).

`python -m scalestudy.paper` writes the tables (scalestudy.paper.tables); the other stages have their
own entry points: `python -m scalestudy.paper.numbers|draft|build`.
"""
