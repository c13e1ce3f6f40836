"""mixq.cli"""
