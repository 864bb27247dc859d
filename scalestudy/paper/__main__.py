"""`python -m scalestudy.paper`: the booktabs tables of the paper (scalestudy.paper.tables)."""

from scalestudy.paper.tables import main

raise SystemExit(main())
