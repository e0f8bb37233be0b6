"""``python -m bastion`` runs the ``bastion`` command."""

import sys

from bastion.cli import main

sys.exit(main())
