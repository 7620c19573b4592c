"""Test support shared by every suite: real servers on loopback, free ports, leak checks."""
