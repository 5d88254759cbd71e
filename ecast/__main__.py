import sys

from ecast.cli import main

sys.exit(main())
