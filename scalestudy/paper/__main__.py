from scalestudy.paper.tables import main

raise SystemExit(main())
