"""``packages`` holds plugin packages, not tests of this repository: their own tests
import the packages, which only the tests beside this folder install (in a directory of
their own) and run. Collecting them here would import packages that are not installed."""

collect_ignore = ["astraflow-advantage-fixed"]
