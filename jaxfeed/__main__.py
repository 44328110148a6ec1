import sys

from jaxfeed.cli import main

sys.exit(main())
