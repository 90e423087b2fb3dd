import sys

from attnzoo.bench import main

raise SystemExit(main(sys.argv[1:]))
