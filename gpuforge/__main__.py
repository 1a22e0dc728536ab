import sys

from gpuforge.cli import main

sys.exit(main())
