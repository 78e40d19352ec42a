import sys

from wanxport.cli import main

sys.exit(main())
