"""podium.launcher"""
