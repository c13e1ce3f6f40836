"""mixq.report"""
