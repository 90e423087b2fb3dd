from attnzoo.cli import main

raise SystemExit(main())
