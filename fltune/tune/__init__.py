"""fltune.tune"""
