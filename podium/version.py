"""podium's version: the one string pyproject reads, the endpoint reports and ``podium doctor`` compares.

A module of its own, importing nothing, so that ``podium.protocol`` can name the server's version
without importing the package root (which reaches ``podium.client`` lazily, and the client imports
the protocol).
"""

__version__ = "0.1.0"
