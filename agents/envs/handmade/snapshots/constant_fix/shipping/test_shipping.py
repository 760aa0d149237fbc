from shipping import shipping_cost


def test_shipping_cost():
    assert shipping_cost(2) == 10


def test_shipping_cost_of_zero():
    assert shipping_cost(0) == 0
