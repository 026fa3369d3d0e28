"""Advantages and losses shared by every trainer backend.

``advantages`` is torch-free (the data layer stamps advantages); ``losses`` imports
torch and is imported only by trainer backends.
"""
