"""Relation extraction (TACRED style): entity markers, data preparation and prediction."""
