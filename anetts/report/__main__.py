import sys

from anetts.report import main

sys.exit(main())
