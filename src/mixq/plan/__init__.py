"""mixq.plan"""
