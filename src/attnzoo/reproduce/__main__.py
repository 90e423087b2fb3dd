from attnzoo.reproduce.cli import main

raise SystemExit(main())
