"""fltune.reproduce"""
