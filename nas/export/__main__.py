"""`python -m nas.export convert FOLDER...`: rewrite exported folders of the old layout."""

import sys

from nas.export.writing import main

sys.exit(main())
