"""fltune.metrics"""
