"""fltune.methods"""
