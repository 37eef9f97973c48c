# The tests import the package from the source tree (python/) unless an installed fa3 is wanted:
# FA3_TESTS_INSTALLED=1 leaves sys.path alone.
import os
import sys

if os.environ.get("FA3_TESTS_INSTALLED") != "1":
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir))
