"""podium.teacher"""
