"""Figures of the study: one style module (style.py), one function per figure."""
