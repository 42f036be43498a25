"""podium.config"""
