"""mixq.passes"""
