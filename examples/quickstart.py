# The Quickstart example: print, compute with pandas, draw a chart.
import matplotlib.pyplot as plt
import pandas as pd

sales = pd.DataFrame({
    "month": ["Jan", "Feb", "Mar", "Apr", "May", "Jun"],
    "units": [120, 135, 160, 150, 190, 230],
})
sales["growth_%"] = sales["units"].pct_change().mul(100).round(1)
print(sales.to_string(index=False))
print(f"\nTotal units: {sales['units'].sum()}, best month: {sales.loc[sales['units'].idxmax(), 'month']}")

ax = sales.plot(x="month", y="units", kind="bar", legend=False, title="Units sold")
ax.set_ylabel("units")
plt.tight_layout()
plt.savefig("sales.png")
print("chart written to sales.png")
