"""mixq.calibration"""
