"""fltune.data"""
