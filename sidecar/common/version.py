"""The package version, on the shared floor so that no module imports the package root for it."""

__version__ = "0.1.0"
