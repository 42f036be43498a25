"""podium.client"""
