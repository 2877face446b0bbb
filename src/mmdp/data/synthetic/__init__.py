"""Synthetic data made in code, so that everything runs offline.

rows    the generator behind the default dataset (the_cauldron's columns)
videos  a synthetic video task (MP4 clips encoded with PyAV)
"""
