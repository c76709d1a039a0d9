"""Tests of the shipped examples' own modules."""
