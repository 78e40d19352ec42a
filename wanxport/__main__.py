from wanxport.cli import main
import sys
sys.exit(main())
