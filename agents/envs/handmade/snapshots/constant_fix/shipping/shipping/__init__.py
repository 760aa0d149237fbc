"""Shipping cost of a parcel in dollars."""

RATE_PER_KG = 3


def shipping_cost(weight_kg):
    """Shipping cost of a parcel in dollars: weight_kg times RATE_PER_KG."""
    return weight_kg * RATE_PER_KG
