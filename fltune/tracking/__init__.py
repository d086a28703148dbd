"""fltune.tracking"""
