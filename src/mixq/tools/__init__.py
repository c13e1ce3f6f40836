"""mixq.tools"""
