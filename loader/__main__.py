import sys

from .frontends.cli import main

sys.exit(main())
