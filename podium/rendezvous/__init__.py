"""podium.rendezvous"""
