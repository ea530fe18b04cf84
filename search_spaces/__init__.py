"""Architectures as data and the torch modules they build. Built in a later issue."""
