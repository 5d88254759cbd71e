import sys

from ecast.tools.cli import main

sys.exit(main())
