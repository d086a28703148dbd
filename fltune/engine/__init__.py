"""fltune.engine"""
