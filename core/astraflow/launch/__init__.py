"""Launchers: start the data layer, RaaS nodes and trainers."""
