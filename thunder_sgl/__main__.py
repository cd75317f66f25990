from thunder_sgl.cli import main

raise SystemExit(main())
