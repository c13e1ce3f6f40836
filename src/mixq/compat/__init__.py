"""mixq.compat"""
