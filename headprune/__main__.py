import sys

from headprune.cli.main import main

sys.exit(main())
