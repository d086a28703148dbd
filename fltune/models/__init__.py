"""fltune.models"""
