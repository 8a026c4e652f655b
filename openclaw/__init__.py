"""Importing OpenClaw / lossless-claw history: the source readers and the importer.
"""
