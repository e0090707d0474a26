import sys

from ttsdock.cli import main

sys.exit(main())
